package kubernetes

import (
	"context"
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

// client is the requests this backend makes of one Lease, through
// client-go's REST client. client-go does not retry them on its own
// (MaxRetries 0): the backend and the runner decide when to send again.
type client struct {
	rest      *rest.RESTClient
	host      string // the server as messages name it, without credentials
	namespace string
	name      string
}

// getLease reads the Lease; a NotFound error if there is none.
func (c *client) getLease(ctx context.Context) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	out := &coordinationv1.Lease{}
	err := c.rest.Get().Namespace(c.namespace).Resource("leases").Name(c.name).MaxRetries(0).Do(ctx).Into(out)
	return out, err
}

// createLease creates l; an AlreadyExists error if it exists.
func (c *client) createLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	out := &coordinationv1.Lease{}
	err := c.rest.Post().Namespace(c.namespace).Resource("leases").MaxRetries(0).Body(l).Do(ctx).Into(out)
	return out, err
}

// updateLease replaces the Lease with l if it is still at l's
// resourceVersion: a Conflict error if it is not, NotFound if it is gone.
func (c *client) updateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	out := &coordinationv1.Lease{}
	err := c.rest.Put().Namespace(c.namespace).Resource("leases").Name(c.name).MaxRetries(0).Body(l).Do(ctx).Into(out)
	return out, err
}

// watchLease watches the Lease, selected by name (which RBAC authorizes
// as a watch of that name), from version rv ("" from its current state,
// which the apiserver sends first as ADDED).
func (c *client) watchLease(ctx context.Context, rv string) (watch.Interface, error) {
	req := c.rest.Get().Namespace(c.namespace).Resource("leases").MaxRetries(0).
		Param("watch", "true").
		Param("fieldSelector", "metadata.name="+c.name).
		Param("allowWatchBookmarks", "true").
		Param("timeoutSeconds", watchTimeoutSeconds)
	if rv != "" {
		req = req.Param("resourceVersion", rv)
	}
	return req.Watch(ctx)
}
