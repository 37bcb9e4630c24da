-- Shared prelude of the owner-checked scripts. An in-flight marker is 58 bytes:
-- format 1, kind 1, fingerprint (32), owner token (16), lease deadline (u64 BE, unix ms).
-- Times come from the calling replica's clock, like the deadlines it writes.
local function owned(v, token)
  return v and string.len(v) == 58 and string.byte(v, 1) == 1 and string.byte(v, 2) == 1
    and string.sub(v, 35, 50) == token
end
local function deadline(v)
  local n = 0
  for i = 51, 58 do
    n = n * 256 + string.byte(v, i)
  end
  return n
end
