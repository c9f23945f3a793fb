//go:build !race

package metrics

// memoryScale: see race_test.go.
const memoryScale = 1
