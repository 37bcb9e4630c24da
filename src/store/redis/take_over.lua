-- take_over: KEYS[1]; ARGV[1] stale token; ARGV[2] new marker head; ARGV[3] lease ms;
-- ARGV[4] record ttl ms; ARGV[5] channel. Only a marker whose lease has ended is replaced.
local v = redis.call('GET', KEYS[1])
if not owned(v, ARGV[1]) then
  return 0
end
local now = now_ms()
if deadline(v) > now then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2] .. be64(now + tonumber(ARGV[3])), 'PX', ARGV[4])
redis.call('PUBLISH', ARGV[5], '1')
return 1
