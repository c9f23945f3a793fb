package redis

import (
	"sync"

	"github.com/redis/go-redis/v9"
)

// script returns a script built on first use: building one hashes its
// source, which every leaderrun would otherwise pay at start.
func script(src string) func() *redis.Script {
	return sync.OnceValue(func() *redis.Script { return redis.NewScript(src) })
}

// The store's Lua scripts (docs/backends/redis.md, "Scripts"). Every key
// a script touches is in KEYS. Numbers go to redis.call as strings: Lua
// writes a number with 14 significant digits, which would round the
// queue's microsecond clock.
//
// luaLib: now() is the server's clock in ms; head() the first waiter
// whose liveness deadline has not passed, dropping any whose has (a dead
// waiter must not hold the queue up); wake() publishes to it alone.
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
end
local function wake(waiters, alive, prefix)
  local h = head(waiters, alive, now())
  if h then redis.call('PUBLISH', prefix .. h, 'free') end
end
`

// getScript: KEYS lock, alive. Returns {value or false, pttl, live waiters}.
var getScript = script(luaLib + `
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('ZCOUNT', KEYS[2], string.format('%d', now()), '+inf')}
`)

// takeScript grants a free lock: INCR of the counter and SET PX of the
// value that holds the token, and the candidate leaves the queue. A
// counter deleted by hand goes on from the history's newest term, not 1.
// KEYS lock, token, history, waiters, alive; ARGV nonce, identity, lease
// ms, holders. Returns the value, false if the lock is held.
var takeScript = script(`
if redis.call('GET', KEYS[1]) then return false end
if redis.call('INCR', KEYS[2]) == 1 then
  local ok, terms = pcall(cjson.decode, redis.call('GET', KEYS[3]) or '[]')
  local top = 0
  for _, t in ipairs(ok and type(terms) == 'table' and terms or {}) do
    if type(t) == 'table' and type(t.token) == 'number' and t.token > top then top = t.token end
  end
  if top >= 1 then redis.call('SET', KEYS[2], string.format('%d', top + 1)) end
end
local pool = ''
if tonumber(ARGV[4]) > 1 then pool = ',"holders":' .. ARGV[4] end
local v = '{"identity":' .. cjson.encode(ARGV[2]) .. ',"nonce":"' .. ARGV[1] ..
  '","token":' .. redis.call('GET', KEYS[2]) .. ',"lease_ms":' .. ARGV[3] .. pool .. '}'
redis.call('SET', KEYS[1], v, 'PX', ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return v
`)

// renewScript: KEYS lock; ARGV value, lease ms. Returns 1 if renewed, 0
// if the lock no longer holds the value.
var renewScript = script(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
`)

// leaveScript frees the lock if it holds a value (a release), or takes a
// waiter's nonce out of the queue (a withdrawal); a free lock wakes the
// first live waiter. KEYS lock, waiters, alive; ARGV value or "", nonce
// or "", wake prefix.
var leaveScript = script(luaLib + `
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
local cur = redis.call('GET', KEYS[1])
if ARGV[1] ~= '' and cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  cur = false
end
if not cur then wake(KEYS[2], KEYS[3], ARGV[3]) end
return 1
`)

// queueScript puts a waiter in the queue by the server's clock, or
// refreshes its liveness deadline there; a free lock whose first live
// waiter is another wakes that one (its wake-up may have been lost).
// KEYS lock, waiters, alive; ARGV nonce, liveness window ms, wake prefix.
// Returns {rank, 1 if the lock is free}.
var queueScript = script(luaLib + `
local ms, t = now()
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])), ARGV[1])
end
redis.call('ZADD', KEYS[3], string.format('%d', ms + tonumber(ARGV[2])), ARGV[1])
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
redis.call('PEXPIREAT', KEYS[2], last)
redis.call('PEXPIREAT', KEYS[3], last)
local h = head(KEYS[2], KEYS[3], ms)
local free = redis.call('PTTL', KEYS[1]) == -2
if free and h and h ~= ARGV[1] then redis.call('PUBLISH', ARGV[3] .. h, 'free') end
return {redis.call('ZRANK', KEYS[2], ARGV[1]), free and 1 or 0}
`)

// docScript replaces a document if it is still what was read ("" if
// none) and, for a fenced write, the lock holds the holder's value.
// KEYS document, lock; ARGV content read, data, value or "". Returns 1 if
// written, 0 if the document changed, -1 if the lock did.
var docScript = script(`
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
`)
