// Command pause is the pod sandbox's first process on the test cluster's real node: it holds the pod's
// namespaces, reaps orphaned children (it is PID 1 of the sandbox), and exits on SIGTERM or SIGINT.
// The test node cannot pull registry.k8s.io/pause, so this static binary becomes its sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
