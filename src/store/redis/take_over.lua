-- take_over: KEYS[1]; ARGV[1] stale token; ARGV[2] the new in-flight marker; ARGV[3]
-- record ttl ms; ARGV[4] channel; ARGV[5] now (unix ms). Only a marker whose lease has
-- ended is replaced.
local v = redis.call('GET', KEYS[1])
if not owned(v, ARGV[1]) then
  return 0
end
if deadline(v) > tonumber(ARGV[5]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], '1')
end
return 1
