//go:build !race

package sqlitestore_test

// raceEnabled is true under the race detector, which slows the transpiled
// SQLite engine down about fifty-fold: size-and-speed tests scale down.
const raceEnabled = false
