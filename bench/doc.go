// Package bench measures leaderrun side by side with `etcdctl lock` and
// `consul lock`, in one run, on the same local etcd and Consul servers: how
// fast each starts its command on a free lock, how much memory it holds
// while leading, how fast it stops its command when the store drops the
// lease, how fast leadership moves on SIGTERM and after kill -9, and what
// an idle follower, a leader, and 200 followers of one lock cost the store;
// what each binary's package init costs, what 1, 5 and 20 leaders cost
// the host (Pss and Private, with leaderrun's watchdog), and what `consul
// lock -n 3` (and leaderrun --holders, where built) does when a holder
// dies.
//
// Every tool runs the same child, bench/child: a small program of its own
// (nothing but the standard library and x/sys/unix to initialise), which
// reports on a unix socket the moment it started and the moment it
// received SIGTERM or SIGINT, on the monotonic clock that the benchmark
// itself reads. Tools alternate run by run, so that noise from the machine
// hits all of them alike.
//
// Run it with scripts/bench.sh, which writes docs/benchmarks.md and
// docs/benchmarks.svg. The code is in the test files: it is a test program,
// run by go test, and skipped unless BENCH=1.
package bench
