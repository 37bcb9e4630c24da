-- claim, for servers before Redis 7.0 (which refuse SET with both NX and GET):
-- KEYS[1] record key; ARGV[1] the in-flight marker; ARGV[2] record ttl ms.
-- Returns what was there (nothing: the marker was written), like SET NX PX GET.
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return v
