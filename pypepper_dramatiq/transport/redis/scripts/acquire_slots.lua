-- Take a slot of each concurrency limit for one holder, all or none. For i in 1 .. n,
-- KEYS[i] is limit i's sorted set of slots (member: a holder; score: when its lease
-- lapses, in seconds of Redis's clock), KEYS[n + i] its line of held starts (member:
-- a job id; score: its place, (9 - priority) * 1e13 + the ms it was first held) and
-- KEYS[2n + i] the hash of their messages (job id -> message). KEYS[3n + 1 ..] are the
-- hashes of the channels whose limit is among them: each records its limit (field
-- max_running, for people: the limit a worker last applied).
-- ARGV: 1 the holder, 2 the lease in seconds, 3 n, 3 + i limit i's count, 4 + n the
-- job id of the start asking ("": none), 5 + n its priority, 6 + n its message, then
-- the channels' limits, in the order of their KEYS.
-- Holders whose lease lapsed are dropped first; a holder already counted keeps its
-- slot; a slot kept for the job (holder "held:<job id>", a release woke it) is taken
-- over. Answers 1 when taken (every lease set, the job out of every line), 0 when a
-- limit is reached: nothing taken, the job in line under each full limit (where it
-- was already, it keeps its place).
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local job = ARGV[4 + n]
local kept = nil
if job ~= '' then kept = 'held:' .. job end
for j = 3 * n + 1, #KEYS do
  redis.call('hset', KEYS[j], 'max_running', ARGV[7 + n + j - 3 * n - 1])
end
-- The sets outlive their last lease by an hour: a key of many (a tenant's) is forgotten.
local keep = math.ceil((lease + 3600) * 1000)
local full = {}
for i = 1, n do
  local key = KEYS[i]
  redis.call('zremrangebyscore', key, '-inf', string.format('%.6f', now))
  if not redis.call('zscore', key, holder)
      and not (kept and redis.call('zscore', key, kept))
      and redis.call('zcard', key) >= tonumber(ARGV[i + 3]) then
    table.insert(full, i)
  end
end
if #full > 0 then
  if kept then
    local place = (9 - tonumber(ARGV[5 + n])) * 1e13 + math.floor(now * 1000)
    for _, i in ipairs(full) do
      redis.call('zadd', KEYS[n + i], 'NX', string.format('%.0f', place), job)
      redis.call('hset', KEYS[2 * n + i], job, ARGV[6 + n])
      redis.call('pexpire', KEYS[n + i], keep)
      redis.call('pexpire', KEYS[2 * n + i], keep)
    end
  end
  return 0
end
local expiry = string.format('%.6f', now + lease)
for i = 1, n do
  if kept then
    redis.call('zrem', KEYS[i], kept)
    redis.call('zrem', KEYS[n + i], job)
    redis.call('hdel', KEYS[2 * n + i], job)
  end
  redis.call('zadd', KEYS[i], expiry, holder)
  redis.call('pexpire', KEYS[i], keep)
end
return 1
