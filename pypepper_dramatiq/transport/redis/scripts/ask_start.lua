-- Ask for a start under a rate limit of ARGV[1] starts per ARGV[2] seconds (ARGV[3]:
-- the limit as written, for people: the channels list shows it; ARGV[4]: "1" when
-- this start was told a time already and comes back at it). KEYS[1] is a hash
-- (``tail``: the last retry time handed out; ``seq``: the members' counter; ``limit``),
-- KEYS[2] a sorted set of the starts granted within the last period (seconds of
-- Redis's clock). Fewer than ARGV[1] there: granted (answer "0", the start added).
-- Else refused, nothing counted, and told when to ask again: a time of its own, no
-- earlier than when the oldest start leaves the window, one spacing (period/count)
-- after the last one told, so that waiting starts come back one by one. A start told
-- a time already keeps its place in line: it is told when the oldest start leaves the
-- window, and the line behind it does not move (it came back at its time, a moment
-- before a start of the period before it left the window).
local t = redis.call('time')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local count = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
redis.call('zremrangebyscore', KEYS[2], '-inf', string.format('%.6f', now - period))
local wait = 0
local tail = tonumber(redis.call('hget', KEYS[1], 'tail') or '0')
if redis.call('zcard', KEYS[2]) < count then
  local seq = redis.call('hincrby', KEYS[1], 'seq', 1)
  redis.call('zadd', KEYS[2], string.format('%.6f', now), seq)
else
  local oldest = tonumber(redis.call('zrange', KEYS[2], 0, 0, 'withscores')[2])
  local slot
  if ARGV[4] == '1' then
    slot = oldest + period
    tail = math.max(tail, slot + period / count)
  else
    slot = math.max(tail, oldest + period)
    tail = slot + period / count
  end
  wait = slot - now
  redis.call('hset', KEYS[1], 'tail', string.format('%.6f', tail))
end
redis.call('hset', KEYS[1], 'limit', ARGV[3])
-- Kept an hour past the window: a key of many (a tenant's) does not stay forever,
-- and the channels list shows a limit applied within the hour.
local keep = math.ceil((math.max(tail - now, 0) + period + 3600) * 1000)
redis.call('pexpire', KEYS[1], keep)
redis.call('pexpire', KEYS[2], keep)
return string.format('%.6f', wait)
