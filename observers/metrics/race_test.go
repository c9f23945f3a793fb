//go:build race

package metrics

// memoryScale: the race detector keeps shadow memory for every allocation
// (several times its size), so the server's memory bounds are scaled.
const memoryScale = 4
