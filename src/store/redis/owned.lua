-- Shared prelude of the owner-checked scripts. An in-flight marker is format 1, kind 1,
-- fingerprint (32), owner token (16), lease deadline (u64 BE, unix ms): 58 bytes; format
-- 2 adds when it was claimed (u64 BE): 66 bytes; format 3 (a streamed request's marker)
-- adds a flags byte: 67 bytes; format 4 has the flags byte always, then the fingerprint
-- rules it was made under: 68 bytes or more.
-- Times come from the calling replica's clock, like the deadlines it writes.
local function marker(v)
  if not v then
    return false
  end
  local len, format = string.len(v), string.byte(v, 1)
  return ((len == 58 and format == 1) or (len == 66 and format == 2) or (len == 67 and format == 3)
      or (len >= 68 and format == 4))
    and string.byte(v, 2) == 1
end
local function owned(v, token)
  return marker(v) and string.sub(v, 35, 50) == token
end
local function deadline(v)
  local n = 0
  for i = 51, 58 do
    n = n * 256 + string.byte(v, i)
  end
  return n
end
