-- complete: KEYS[1]; ARGV[1] token; ARGV[2] completed record; ARGV[3] ttl ms; ARGV[4] channel.
local v = redis.call('GET', KEYS[1])
if not owned(v, ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
