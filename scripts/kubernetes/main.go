// One binary for the test cluster of scripts/ci-kubernetes.sh, as the old hyperkube was: the
// commands share one link and one build cache. It runs the command named by its own name
// (a symlink: kubelet, kubectl, ...) or by its first argument (kube kubelet --help).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	_ "time/tzdata"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if _, known := commands[name]; !known && name != "kubectl" && name != "etcd" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	switch name {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
	case "kubectl":
		os.Args = append([]string{"kubectl"}, args...)
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	default:
		newCommand, known := commands[name]
		if !known {
			fmt.Fprintln(os.Stderr, "usage: kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl [ARGS...]")
			os.Exit(2)
		}
		command := newCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	}
}
