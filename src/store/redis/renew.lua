-- renew: KEYS[1]; ARGV[1] token; ARGV[2] new lease deadline (u64 BE); ARGV[3] lease ms.
-- The record's ttl is kept, but never shorter than the new lease.
local v = redis.call('GET', KEYS[1])
if not owned(v, ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], string.sub(v, 1, 50) .. ARGV[2] .. string.sub(v, 59), 'KEEPTTL')
local lease = tonumber(ARGV[3])
local pttl = redis.call('PTTL', KEYS[1])
if pttl >= 0 and pttl < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
