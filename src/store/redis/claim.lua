-- claim: KEYS[1] record key; ARGV[1] marker head (format, kind, fingerprint, token);
-- ARGV[2] lease ms; ARGV[3] record ttl ms.
-- Absent: write the in-flight marker, return {1}. Present: return {0, record, now}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
if not v then
  local n = now + tonumber(ARGV[2])
  local b = {}
  for i = 8, 1, -1 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  redis.call('SET', KEYS[1], ARGV[1] .. table.concat(b), 'PX', ARGV[3])
  return {1}
end
return {0, v, now}
