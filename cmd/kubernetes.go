package cmd

import (
	"errors"
	"os"

	"github.com/urfave/cli/v2"
	"k8s.io/klog/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/kubernetes"
)

// kubernetesFlags are the flags of the Kubernetes backend. KUBECONFIG is
// read as kubectl reads it (a list of files), but only once the backend is
// chosen: jobs commonly have it set for their own work, so it never
// selects the store by itself, and --kubeconfig has no variable.
func kubernetesFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "kubeconfig", Category: categoryStore,
			Usage: "kubeconfig `FILE` of the Kubernetes API (selects the backend); with --backend kubernetes and no --kubeconfig: " +
				"the files in KUBECONFIG, else ~/.kube/config, else the pod's service account (KUBERNETES_SERVICE_HOST)"},
		&cli.StringFlag{Name: "namespace", Category: categoryStore, EnvVars: []string{"LEADERRUN_NAMESPACE"},
			Usage: "`NS` of the lock's Lease (default: in a pod POD_NAMESPACE, else the service account's; else the kubeconfig context's, else default)"},
	}
}

var kubernetesStore = store{
	name:     "kubernetes",
	flags:    kubernetesFlags,
	selected: func(c *cli.Context) bool { return c.String("kubeconfig") != "" },
	open:     newKubernetesStore,
	address:  "--kubeconfig (or --backend kubernetes with KUBECONFIG, or in a pod)",
	// A kubeconfig or a service account token is usually the job's own
	// access to the cluster too: nothing is removed.
}

// newKubernetesStore validates the Kubernetes flags, loads the API
// configuration as kubectl would and opens the store. Nothing is sent to
// the apiserver: a refusal (RBAC) shows in the first request, as exit 69
// naming the verb.
func newKubernetesStore(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	if err := kubernetes.ValidateLockName(cfg.Lock); err != nil {
		return nil, usageErrorf("--lock: %v", err)
	}
	ns := c.String("namespace")
	if c.IsSet("namespace") {
		if err := kubernetes.ValidateNamespace(ns); err != nil {
			return nil, usageErrorf("--namespace (LEADERRUN_NAMESPACE): %v", err)
		}
	}
	// client-go logs through klog: into leaderrun's log, one line per
	// event, as everything else.
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	klog.SetSlogLogger(log.With("backend", "kubernetes"))
	api, err := kubernetes.LoadAPIConfig(kubernetes.LoadOptions{Kubeconfig: c.String("kubeconfig")})
	if err != nil {
		switch {
		case errors.Is(err, kubernetes.ErrNoConfig):
			return nil, usageErrorf("--backend kubernetes: %v", err)
		case c.String("kubeconfig") != "":
			return nil, usageErrorf("--kubeconfig: %v", err)
		}
		return nil, usageErrorf("%v", err)
	}
	s, err := kubernetes.Open(api, ns)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return s, nil
}
