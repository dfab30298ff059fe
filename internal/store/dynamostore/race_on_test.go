//go:build race

package dynamostore

// raceEnabled is true under the race detector, which slows the SDK's
// request path several-fold: size tests scale down.
const raceEnabled = true
