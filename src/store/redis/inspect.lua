-- inspect (docs/behaviour.md §13): KEYS[1]. What the key holds and when it expires (unix
-- ms on the server's clock), read together: {} when nothing is there, else {value,
-- expires at}.
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
local at = redis.pcall('PEXPIRETIME', KEYS[1])
if type(at) ~= 'number' then
  -- Before Redis 7.0: the remaining ttl from the server's clock.
  local now = redis.call('TIME')
  local pttl = redis.call('PTTL', KEYS[1])
  at = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + pttl
end
return {v, at}
