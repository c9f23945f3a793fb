package redis

import (
	"sync"

	"github.com/redis/go-redis/v9"
)

// script returns a script built on first use: building one hashes its
// source, which every leaderrun would otherwise pay at start, whatever
// its store.
func script(src string) func() *redis.Script {
	return sync.OnceValue(func() *redis.Script { return redis.NewScript(src) })
}

// The Lua scripts the backend runs: each is atomic on the server (Redis
// runs one script at a time, and replicates its writes as one
// transaction), which is what makes a grant and its token one step. Every
// key a script touches is in KEYS. Numbers go to redis.call as strings
// (string.format('%d') or the strings Redis returned): Lua turns a number
// into text with 14 significant digits, which would round the
// microsecond clock used for queue order.
//
// The lock's value is built by the acquiring script, JSON that Status
// reads and that renew, release and complete compare byte for byte:
//
//	{"identity":"host:123","nonce":"<32 hex>","token":42,"lease_ms":15000}
//
// with ,"holders":N before the brace when the holder campaigned for a
// pool of N > 1 (--holders).

// luaLib is shared by the scripts that read the queue. now() is the
// server's clock in milliseconds; head(now) is the first waiter whose
// liveness deadline has not passed, dropping from the front any whose has
// (a crashed waiter must not block the queue); wake(now) publishes to the
// first live waiter's channel, KEYS[3] and KEYS[4] being the queue and
// the liveness deadlines, ARGV[prefixArg] the channels' prefix.
const luaLib = `
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
local function head(waiters, alive, ms)
  for _ = 1, 100 do
    local h = redis.call('ZRANGE', waiters, 0, 0)[1]
    if not h then return nil end
    local d = redis.call('ZSCORE', alive, h)
    if d and tonumber(d) >= ms then return h end
    redis.call('ZREM', waiters, h)
    redis.call('ZREM', alive, h)
  end
  return nil
end
local function wake(waiters, alive, ms, prefix)
  local h = head(waiters, alive, ms)
  if h then redis.call('PUBLISH', prefix .. h, 'free') end
end
`

// acquireScript is one attempt of a candidate.
//
//	KEYS: lock, token, waiters, alive, history
//	ARGV: nonce, identity, lease ms, "try" or "wait", liveness window ms, wake prefix, holders
//
// It grants the lock if it is free and the candidate is first in the
// queue (or the queue is empty): INCR of the token and SET NX PX of the
// lock in one step. A value with the candidate's nonce is a grant whose
// answer was lost: it is returned as won, after a PEXPIRE that gives the
// caller a write of its own to WAIT for. Otherwise a waiting candidate
// joins the queue, or refreshes its liveness deadline there.
//
// Returns {1, value, pttl} when won; {0, holder's value or false, pttl,
// rank (-1 with try), live waiters} otherwise.
var acquireScript = script(luaLib + `
local ms, t = now()
local cur = redis.call('GET', KEYS[1])
if cur then
  if string.find(cur, '"nonce":"' .. ARGV[1] .. '"', 1, true) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1, cur, redis.call('PTTL', KEYS[1])}
  end
else
  local h = head(KEYS[3], KEYS[4], ms)
  if h == nil or h == ARGV[1] then
    local tok = redis.call('INCR', KEYS[2])
    if tok == 1 then
      -- The counter was deleted by hand: go on from the newest term in
      -- the history, if any, rather than from 1.
      local top = redis.call('ZREVRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]
      if top and tonumber(top) >= 1 then
        redis.call('SET', KEYS[2], string.format('%d', tonumber(top) + 1))
      end
    end
    local pool = ''
    if tonumber(ARGV[7]) > 1 then
      pool = ',"holders":' .. ARGV[7]
    end
    local v = '{"identity":' .. cjson.encode(ARGV[2]) .. ',"nonce":"' .. ARGV[1] ..
      '","token":' .. redis.call('GET', KEYS[2]) .. ',"lease_ms":' .. ARGV[3] .. pool .. '}'
    redis.call('SET', KEYS[1], v, 'NX', 'PX', ARGV[3])
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
    return {1, v, redis.call('PTTL', KEYS[1])}
  end
end
if ARGV[4] == 'try' then
  return {0, cur, redis.call('PTTL', KEYS[1]), -1, redis.call('ZCOUNT', KEYS[4], ms, '+inf')}
end
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('ZADD', KEYS[3], t[1] .. string.format('%06d', tonumber(t[2])), ARGV[1])
end
redis.call('ZADD', KEYS[4], string.format('%d', ms + tonumber(ARGV[5])), ARGV[1])
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
redis.call('PEXPIREAT', KEYS[3], last)
redis.call('PEXPIREAT', KEYS[4], last)
local h = head(KEYS[3], KEYS[4], ms)
if not cur and h ~= ARGV[1] then
  -- Free, and the first live waiter has not taken it: it may not know.
  redis.call('PUBLISH', ARGV[6] .. h, 'free')
end
return {0, cur, redis.call('PTTL', KEYS[1]), redis.call('ZRANK', KEYS[3], ARGV[1]),
  redis.call('ZCOUNT', KEYS[4], ms, '+inf')}
`)

// renewScript extends the lease if the lock still holds our value.
//
//	KEYS: lock
//	ARGV: value, lease ms
//
// Returns 1 when renewed, else the lock's current value ("" if none).
var renewScript = script(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return cur or ''
`)

// releaseScript frees the lock if it still holds our value, appends the
// term to the history (even after a loss: the term happened) and keeps
// the newest HistoryLimit of it, and wakes the first live waiter.
//
//	KEYS: lock, token (unused), waiters, alive, history
//	ARGV: value, term JSON ("" for none), term token, -(limit+1), wake prefix
//
// Returns 1 if it freed the lock.
var releaseScript = script(luaLib + `
local freed = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  freed = 1
end
if ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[3], ARGV[2])
  redis.call('ZREMRANGEBYRANK', KEYS[5], 0, ARGV[4])
end
if freed == 1 then
  local ms = now()
  wake(KEYS[3], KEYS[4], ms, ARGV[5])
end
return freed
`)

// withdrawScript takes a candidate out of the queue, and frees the lock
// if a grant whose answer was lost made it the holder; a free lock
// wakes the first live waiter.
//
//	KEYS: lock, token (unused), waiters, alive
//	ARGV: nonce, wake prefix
var withdrawScript = script(luaLib + `
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
local cur = redis.call('GET', KEYS[1])
if cur and string.find(cur, '"nonce":"' .. ARGV[1] .. '"', 1, true) then
  redis.call('DEL', KEYS[1])
  cur = false
end
if not cur then
  local ms = now()
  wake(KEYS[3], KEYS[4], ms, ARGV[2])
end
return 1
`)

// completeScript writes a completion marker only while the lock holds
// our value.
//
//	KEYS: lock, marker
//	ARGV: value, marker JSON, keep ms
//
// Returns 1 if written.
var completeScript = script(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
`)

// statusScript reads the lock and counts the live waiters.
//
//	KEYS: lock, alive
//
// Returns {value or false, pttl, live waiters}.
var statusScript = script(`
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('ZCOUNT', KEYS[2], string.format('%d', ms), '+inf')}
`)
