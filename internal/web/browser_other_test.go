//go:build browser && !linux

package web_test

import "os/exec"

// dieWithTest does nothing here: only Linux can tie a child's life to its
// parent's. TestMain still stops the server when the tests end normally.
func dieWithTest(*exec.Cmd) {}
