// chartcheck renders a Helm chart the way `helm template` does (Helm's own Go packages, client only) and decodes
// every rendered manifest strictly into the Kubernetes API types (client-go's scheme) and the prometheus-operator
// types (ServiceMonitor, PrometheusRule): an unknown field, a wrong type or an unregistered kind is an error. It also
// runs Helm's linter (`helm lint`) on the chart with the same values.
//
//	chartcheck [-f values.yaml]... CHART_DIR
//
// Prints one JSON document on stdout: {"lint": [{"severity", "path", "message"}], "manifests": [{"source", "kind",
// "name", "object"}]}, each object as rendered (YAML turned into JSON), for the tests to look into. Exit status: 0
// when the chart rendered and every manifest decoded; 1 otherwise, the reasons on stderr (lint findings are
// reported, not judged: the tests decide).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const (
	releaseName = "trace-repro"
	namespace   = "observability"
	kubeVersion = "v1.34.0"
)

type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

type lintMessage struct {
	Severity string `json:"severity"`
	Path     string `json:"path"`
	Message  string `json:"message"`
}

type manifest struct {
	Source string         `json:"source"`
	Kind   string         `json:"kind"`
	Name   string         `json:"name"`
	Object map[string]any `json:"object"`
}

type report struct {
	Lint      []lintMessage `json:"lint"`
	Manifests []manifest    `json:"manifests"`
}

func main() {
	var files valueFiles
	flag.Var(&files, "f", "a values file (repeatable; later files win)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: chartcheck [-f values.yaml]... CHART_DIR")
		os.Exit(2)
	}
	out, err := check(flag.Arg(0), files)
	if out != nil {
		if encodeErr := json.NewEncoder(os.Stdout).Encode(out); encodeErr != nil {
			err = errors.Join(err, encodeErr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func check(chartDir string, files []string) (*report, error) {
	vals, err := (&values.Options{ValueFiles: files}).MergeValues(getter.Providers{})
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out := &report{Lint: lintChart(chartDir, vals), Manifests: []manifest{}}
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return out, fmt.Errorf("loading the chart: %w", err)
	}
	rendered, err := render(chrt, vals)
	if err != nil {
		return out, err
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), monitoringv1.AddToScheme(scheme)); err != nil {
		return out, err
	}
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	var problems []error
	for _, m := range rendered {
		item, err := decode(strict, m)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", m.Name, err))
			continue
		}
		out.Manifests = append(out.Manifests, item)
	}
	return out, errors.Join(problems...)
}

// lintChart is `helm lint` with the given values: the chart file, the values, every template rendered.
func lintChart(chartDir string, vals map[string]any) []lintMessage {
	kube, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		panic(err)
	}
	found := []lintMessage{}
	names := map[int]string{0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
	for _, m := range lint.AllWithKubeVersion(chartDir, vals, namespace, kube).Messages {
		found = append(found, lintMessage{Severity: names[m.Severity], Path: m.Path, Message: m.Err.Error()})
	}
	return found
}

// render is `helm template`: an install run client-only as a dry run, hooks included.
func render(chrt *chart.Chart, vals map[string]any) ([]releaseutil.Manifest, error) {
	kube, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	cfg := &action.Configuration{Log: func(string, ...any) {}}
	install := action.NewInstall(cfg)
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.IncludeCRDs = true
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.KubeVersion = kube
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering: %w", err)
	}
	docs := releaseutil.SplitManifests(rel.Manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	found := make([]releaseutil.Manifest, 0, len(keys)+len(rel.Hooks))
	for _, k := range keys {
		found = append(found, releaseutil.Manifest{Name: source(docs[k]), Content: docs[k]})
	}
	for _, h := range rel.Hooks {
		found = append(found, releaseutil.Manifest{Name: h.Path, Content: h.Manifest})
	}
	return found, nil
}

// source is the template a rendered document came from (Helm's "# Source: <path>" line).
func source(doc string) string {
	for _, line := range strings.Split(doc, "\n") {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "# Source: "); ok {
			return path
		}
	}
	return "(unknown)"
}

func decode(strict runtime.Decoder, m releaseutil.Manifest) (manifest, error) {
	obj, gvk, err := strict.Decode([]byte(m.Content), nil, nil)
	if err != nil {
		return manifest{}, err // an unknown field, a wrong type or a kind no scheme knows
	}
	if _, ok := obj.(runtime.Unstructured); ok {
		return manifest{}, fmt.Errorf("%s is not a known API type", gvk)
	}
	asJSON, err := yaml.YAMLToJSON([]byte(m.Content))
	if err != nil {
		return manifest{}, err
	}
	var object map[string]any
	if err := json.Unmarshal(asJSON, &object); err != nil {
		return manifest{}, err
	}
	metadata, _ := object["metadata"].(map[string]any)
	name, _ := metadata["name"].(string)
	return manifest{Source: m.Name, Kind: gvk.Kind, Name: name, Object: object}, nil
}
