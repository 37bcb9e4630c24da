-- purge (docs/behaviour.md §13): KEYS[1]; ARGV[1] now (unix ms); ARGV[2] '1' to remove a
-- live marker too; ARGV[3] channel ('' when nobody can be waiting). Returns {0} when
-- nothing is there, {2} for a marker whose lease is live (not removed), {1, what was
-- there} when it removed it.
local v = redis.call('GET', KEYS[1])
if not v then
  return {0}
end
if ARGV[2] ~= '1' and marker(v) and deadline(v) > tonumber(ARGV[1]) then
  return {2}
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], '1')
end
return {1, v}
