// The pod sandbox's process (the "pause" image) of the test cluster: it holds the pod's
// namespaces and waits for the signal that ends the pod.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
