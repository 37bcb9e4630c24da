-- claim, for servers before Redis 7.0 (which refuse SET with both NX and GET):
-- KEYS[1] record key; ARGV[1] the in-flight marker; ARGV[2] record ttl ms.
-- Returns what the key holds once it ran: the record that was there, or the marker it
-- wrote. Never nothing, which is also what a reply the client could not read becomes.
local v = redis.call('GET', KEYS[1])
if v then
  return v
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
