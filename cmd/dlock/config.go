package main

// Configuration sources of dlock serve and dlock dev: every flag can also be
// set in the environment as DLOCK_<FLAG> (upper case, dashes as
// underscores: --data-dir is DLOCK_DATA_DIR) and in a YAML file named by
// --config (keys are the flag names: data-dir: /var/lib/dlock). A flag on
// the command line wins over the environment, which wins over the file.

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// envName is the environment variable that sets a flag.
func envName(flagName string) string {
	return "DLOCK_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// registerConfig adds --config to fs; call applyConfig after parsing.
func registerConfig(fs *pflag.FlagSet) *string {
	return fs.String("config", "", "YAML `FILE` of flag values (keys are flag names, e.g. data-dir: /var/lib/dlock); flags and DLOCK_* variables win over it (env DLOCK_CONFIG)")
}

// notConfigurable are the flags that neither DLOCK_* nor the file set.
var notConfigurable = map[string]bool{"config": true, "help": true}

// applyConfig sets every flag the command line left unset from the
// environment, then from the config file; cmdPath ("dlock serve") names the
// command in messages. A key the file has that is no flag, or a value a
// flag refuses, is an error naming the key or variable.
func applyConfig(fs *pflag.FlagSet, configPath, cmdPath string) error {
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	if configPath == "" && !set["config"] {
		configPath = os.Getenv("DLOCK_CONFIG")
	}
	file := map[string]string{}
	if configPath != "" {
		var err error
		if file, err = readConfigFile(configPath, fs, cmdPath); err != nil {
			return err
		}
	}
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if set[f.Name] || notConfigurable[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
			return
		}
		if v, ok := file[f.Name]; ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s: %q: %w", configPath, f.Name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// readConfigFile reads a flat YAML map of flag names to values. A list
// becomes a comma-separated value (initial-cluster: [n1=a:1, n2=b:2]).
func readConfigFile(path string, fs *pflag.FlagSet, cmdPath string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config file: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config file %s: %w (want a YAML map of flag names to values)", path, err)
	}
	out := map[string]string{}
	var unknown []string
	for k, v := range raw {
		if fs.Lookup(k) == nil || notConfigurable[k] {
			unknown = append(unknown, k)
			continue
		}
		switch x := v.(type) {
		case []any:
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			out[k] = strings.Join(parts, ",")
		case map[string]any:
			return nil, fmt.Errorf("config file %s: %s: want a value or a list, not a map", path, k)
		case nil:
			out[k] = ""
		default:
			out[k] = fmt.Sprint(x)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("config file %s: unknown key(s) %s: keys are the flag names of %s without dashes in front (see %s --help)",
			path, strings.Join(unknown, ", "), cmdPath, cmdPath)
	}
	return out, nil
}

// aclTokenEnv is the ACL token from the environment: DLOCK_ACL_TOKEN, the one
// name every command (and dlock serve) reads, or DLOCK_ACL_TOKEN, its older name.
func aclTokenEnv() string {
	if v := os.Getenv("DLOCK_ACL_TOKEN"); v != "" {
		return v
	}
	return os.Getenv("DLOCK_TOKEN")
}
