-- Shared prelude of the owner-checked scripts. An in-flight marker is 58 bytes:
-- format 1, kind 1, fingerprint (32), owner token (16), lease deadline (u64 BE, unix ms).
local function owned(v, token)
  return v and string.len(v) == 58 and string.byte(v, 1) == 1 and string.byte(v, 2) == 1
    and string.sub(v, 35, 50) == token
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function be64(n)
  local b = {}
  for i = 8, 1, -1 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end
local function deadline(v)
  local n = 0
  for i = 51, 58 do
    n = n * 256 + string.byte(v, i)
  end
  return n
end
