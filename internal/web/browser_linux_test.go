//go:build browser && linux

package web_test

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel kill cmd when the test process dies, so a
// test binary killed by its -timeout leaves no `batchgen serve` behind.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
