// Command k8selector is a client-go LeaderElector on one Lease, for the
// tests that make it contend with leaderrun: it is what a Kubernetes
// controller runs to elect a leader. It prints one line per event on
// standard output, with the wall-clock time in Unix nanoseconds:
//
//	started <ns>   OnStartedLeading: from now on it acts as the leader
//	stopped <ns>   it stops acting as the leader (its context ended)
//	leader <ns> <identity>   OnNewLeader
//
// SIGTERM or SIGINT cancel the election; with -release-on-cancel (the
// default) client-go then clears the holder before the process exits.
// It is a module of its own so that its typed clients (and the
// kubernetes/scheme they register) stay out of leaderrun's packages.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	lock := flag.String("lock", "", "name of the Lease")
	identity := flag.String("identity", "", "holder identity")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	release := flag.Bool("release-on-cancel", true, "ReleaseOnCancel")
	flag.Parse()
	klog.SetOutput(os.Stderr)

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	client, err := coordinationv1.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var mu sync.Mutex
	var started atomic.Bool
	stopped := make(chan struct{})
	emit := func(event string, extra ...string) {
		mu.Lock()
		defer mu.Unlock()
		line := fmt.Sprintf("%s %d", event, time.Now().UnixNano())
		for _, e := range extra {
			line += " " + e
		}
		fmt.Println(line)
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *lock},
			Client:     client,
			LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
		},
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: *release,
		Name:            *lock,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				started.Store(true)
				defer close(stopped)
				emit("started")
				<-ctx.Done()
				emit("stopped")
			},
			// client-go calls it once the leading context is cancelled;
			// waiting for the callback keeps the process from exiting
			// before "stopped" is printed.
			OnStoppedLeading: func() {
				if started.Load() {
					<-stopped
				}
			},
			OnNewLeader: func(id string) { emit("leader", id) },
		},
	})
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "k8selector:", err)
	os.Exit(1)
}
