-- complete: KEYS[1]; ARGV[1] token; ARGV[2] completed record; ARGV[3] ttl ms; ARGV[4] channel
-- ('' when nobody can be waiting: no PUBLISH).
-- Repeating a completion that already landed (a retry after a timed-out call) is done.
local v = redis.call('GET', KEYS[1])
if not owned(v, ARGV[1]) then
  if v == ARGV[2] then
    return 1
  end
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], '1')
end
return 1
