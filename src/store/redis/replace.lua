-- replace (docs/behaviour.md §18, resolving an unknown outcome): KEYS[1]; ARGV[1] the
-- value expected there; ARGV[2] the new value, or '' to remove it. Changes the key only
-- if it still holds exactly ARGV[1], keeping its expiry: a concurrent resolve or purge
-- is never overwritten. Returns 1 when replaced, 0 when it held something else, -1 when
-- it held nothing.
local v = redis.call('GET', KEYS[1])
if not v then
  return -1
end
if v ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
