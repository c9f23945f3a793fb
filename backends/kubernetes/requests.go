package kubernetes

import (
	"context"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// requestTimeout bounds every request that is not a watch, unless the
// caller's context ends sooner, so that a connection that stalls without
// closing cannot hang a campaign.
const requestTimeout = 10 * time.Second

// watchTimeoutSeconds asks the apiserver to end each watch after 5
// minutes (it would otherwise pick 30 to 60): the watcher opens the next
// one at once, so a watch that broke silently is replaced within that
// time. Renewals notice a broken link far sooner; this bounds how long a
// follower may miss a release.
const watchTimeoutSeconds = "300"

// client is the requests the store makes of the Leases of one namespace,
// through client-go's REST client. client-go does not retry them on its
// own (MaxRetries 0): the driver and the runner decide when to send again.
type client struct {
	rest      *rest.RESTClient
	host      string // the server as messages name it, without credentials
	namespace string
}

func (c *client) leases(verb string) *rest.Request {
	return c.rest.Verb(verb).Namespace(c.namespace).Resource("leases").MaxRetries(0)
}

// get reads the Lease name: a NotFound error if there is none.
func (c *client) get(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	return c.do(ctx, c.leases(http.MethodGet).Name(name))
}

// create creates l: an AlreadyExists error if it exists.
func (c *client) create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return c.do(ctx, c.leases(http.MethodPost).Body(l))
}

// update replaces the Lease with l if it is still at l's resourceVersion:
// a Conflict error if it is not, NotFound if it is gone.
func (c *client) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	return c.do(ctx, c.leases(http.MethodPut).Name(l.Name).Body(l))
}

func (c *client) do(ctx context.Context, req *rest.Request) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	out := &coordinationv1.Lease{}
	return out, req.Do(ctx).Into(out)
}

// watch watches the Lease name, selected by name (which RBAC authorizes
// as a watch of that name), from version rv ("" from its current state,
// which the apiserver sends first as ADDED).
func (c *client) watch(ctx context.Context, name, rv string) (watch.Interface, error) {
	req := c.leases(http.MethodGet).Param("watch", "true").Param("fieldSelector", "metadata.name="+name).
		Param("allowWatchBookmarks", "true").Param("timeoutSeconds", watchTimeoutSeconds)
	if rv != "" {
		req = req.Param("resourceVersion", rv)
	}
	return req.Watch(ctx)
}
