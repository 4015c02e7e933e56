// A go-plugin 1.0.1 echo peer, for `bench/go-plugin/run.sh`: the same 300-byte echo that `sdk-host bench`
// measures, over go-plugin's net/rpc protocol (the plugin is this binary, re-executed as a child process,
// talking over a Unix socket through yamux). Prints one "key value" line per figure, which
// `sdk-host bench --peer` reads and prints beside its own.
package main

import (
	"fmt"
	"io/ioutil"
	"log"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
)

// Echoer is the plugin's interface: one call, the bytes back.
type Echoer interface {
	Echo(payload []byte) []byte
}

type echoImpl struct{}

func (echoImpl) Echo(payload []byte) []byte { return payload }

// echoRPCServer runs in the plugin process.
type echoRPCServer struct{ impl Echoer }

func (s *echoRPCServer) Echo(payload []byte, reply *[]byte) error {
	*reply = s.impl.Echo(payload)
	return nil
}

// echoRPCClient is what the host calls.
type echoRPCClient struct{ client *rpc.Client }

func (c *echoRPCClient) Echo(payload []byte) []byte {
	var reply []byte
	if err := c.client.Call("Plugin.Echo", payload, &reply); err != nil {
		log.Fatalf("echo call: %v", err)
	}
	return reply
}

type echoPlugin struct{ impl Echoer }

func (p *echoPlugin) Server(*plugin.MuxBroker) (interface{}, error) {
	return &echoRPCServer{impl: p.impl}, nil
}
func (p *echoPlugin) Client(b *plugin.MuxBroker, c *rpc.Client) (interface{}, error) {
	return &echoRPCClient{client: c}, nil
}

var handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "SDK_HOST_BENCH_PLUGIN",
	MagicCookieValue: "echo",
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func pipelined(echo Echoer, payload []byte, inFlight, total int) float64 {
	var wg sync.WaitGroup
	per := total / inFlight
	start := time.Now()
	for g := 0; g < inFlight; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if len(echo.Echo(payload)) != len(payload) {
					log.Fatal("short echo")
				}
			}
		}()
	}
	wg.Wait()
	return float64(per*inFlight) / time.Since(start).Seconds()
}

// cpuNanoseconds is the CPU time all of pid's live threads have run (the first field of each
// /proc/<pid>/task/*/schedstat), as sdk-host's bench reads it; 0 if it cannot be read.
func cpuNanoseconds(pid int) uint64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var total uint64
	for _, task := range tasks {
		text, err := ioutil.ReadFile(task)
		if err != nil {
			continue
		}
		if fields := strings.Fields(string(text)); len(fields) > 0 {
			n, _ := strconv.ParseUint(fields[0], 10, 64)
			total += n
		}
	}
	return total
}

func main() {
	if os.Getenv(handshake.MagicCookieKey) == handshake.MagicCookieValue {
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig: handshake,
			Plugins:         map[string]plugin.Plugin{"echo": &echoPlugin{impl: echoImpl{}}},
		})
		return
	}
	scale := 1
	if len(os.Args) > 1 && os.Args[1] == "--full" {
		scale = 5
	}
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	cmd := pluginCommand(self)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: handshake,
		Plugins:         map[string]plugin.Plugin{"echo": &echoPlugin{}},
		Cmd:             cmd,
		Logger:          hclog.New(&hclog.LoggerOptions{Output: ioutil.Discard, Level: hclog.Error}),
	})
	defer client.Kill()
	rpcClient, err := client.Client()
	if err != nil {
		log.Fatal(err)
	}
	raw, err := rpcClient.Dispense("echo")
	if err != nil {
		log.Fatal(err)
	}
	echo := raw.(Echoer)
	payload := make([]byte, 300)
	for i := range payload {
		payload[i] = 'Z'
	}
	count := 4000 * scale
	samples := make([]float64, 0, count)
	for i := 0; i < count+count/10; i++ {
		start := time.Now()
		echo.Echo(payload)
		if i >= count/10 {
			samples = append(samples, float64(time.Since(start).Nanoseconds())/1000)
		}
	}
	sort.Float64s(samples)
	result := map[string]float64{
		"go_plugin_rtt_p50_us": percentile(samples, 0.5),
		"go_plugin_rtt_p99_us": percentile(samples, 0.99),
	}
	for _, depth := range []int{1, 8, 64} {
		result[fmt.Sprintf("go_plugin_rps_%d", depth)] = pipelined(echo, payload, depth, 4000*scale)
	}
	// CPU per request at 64 in flight, the client's and the plugin's, as sdk-host's bench measures its own.
	const cpuCount = 20000
	selfBefore, pluginBefore := cpuNanoseconds(os.Getpid()), cpuNanoseconds(cmd.Process.Pid)
	pipelined(echo, payload, 64, cpuCount)
	selfAfter, pluginAfter := cpuNanoseconds(os.Getpid()), cpuNanoseconds(cmd.Process.Pid)
	if pluginBefore > 0 && pluginAfter > pluginBefore {
		app := float64(selfAfter-selfBefore) / 1000 / cpuCount
		worker := float64(pluginAfter-pluginBefore) / 1000 / cpuCount
		result["go_plugin_app_cpu_us_per_request"] = app
		result["go_plugin_worker_cpu_us_per_request"] = worker
		result["go_plugin_total_cpu_us_per_request"] = app + worker
	}
	keys := make([]string, 0, len(result))
	for key := range result {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fmt.Printf("%s %.3f\n", key, result[key])
	}
}

// pluginCommand re-executes this binary as the plugin, killed by the kernel if this process dies first (a
// bench stopped midway leaves no plugin behind).
func pluginCommand(self string) *exec.Cmd {
	cmd := exec.Command(self)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}
