-- Give back a holder's concurrency slots and wake the first start in each one's line.
-- For i in 1 .. n (n = #KEYS / 3): KEYS[i] limit i's sorted set of slots, KEYS[n + i]
-- its line of held starts, KEYS[2n + i] their messages (see acquire_slots.lua).
-- ARGV[1] the holder, ARGV[2] how long the slot is kept for the start woken (seconds).
-- For each slot the holder gave back (it held it), the first start in line (lowest
-- place: highest priority, then the first held) leaves the line and the slot is kept
-- for its job (holder "held:<job id>"). Answers job id, priority and message of each
-- start woken, in turn.
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = #KEYS / 3
local holder = ARGV[1]
local reserve = tonumber(ARGV[2])
local woken = {}
for i = 1, n do
  if redis.call('zrem', KEYS[i], holder) == 1 then
    local first = redis.call('zrange', KEYS[n + i], 0, 0, 'WITHSCORES')
    if first[1] then
      local job = first[1]
      local data = redis.call('hget', KEYS[2 * n + i], job) or ''
      redis.call('zrem', KEYS[n + i], job)
      redis.call('hdel', KEYS[2 * n + i], job)
      redis.call('zadd', KEYS[i], string.format('%.6f', now + reserve), 'held:' .. job)
      table.insert(woken, job)
      table.insert(woken, tostring(9 - math.floor(tonumber(first[2]) / 1e13)))
      table.insert(woken, data)
    end
  end
end
return woken
