-- inspect (SPEC §13): KEYS[1]. What the key holds and its remaining ttl in ms, read
-- together: {} when nothing is there, else {value, pttl}.
local v = redis.call('GET', KEYS[1])
if not v then
  return {}
end
return {v, redis.call('PTTL', KEYS[1])}
