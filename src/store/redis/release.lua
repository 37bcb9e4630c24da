-- release: KEYS[1]; ARGV[1] token; ARGV[2] channel.
local v = redis.call('GET', KEYS[1])
if not owned(v, ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
