package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/client"
)

const aclLong = `Manages the ACL tokens of a cluster run with --acl. Tokens are sent with
--acl-token or DLOCK_ACL_TOKEN. docs/security.md explains the permissions.`

// ruleFlags collects repeated --rule flags.
type ruleFlags []client.ACLRule

func (r *ruleFlags) String() string { return fmt.Sprint(*r) }

func (r *ruleFlags) Type() string { return "PREFIX=PERM" }

func (r *ruleFlags) Set(v string) error {
	prefix, perms, ok := strings.Cut(v, "=")
	if !ok || perms == "" {
		return fmt.Errorf("--rule %q: want PREFIX=PERM[,PERM...], e.g. billing/=lock,read", v)
	}
	*r = append(*r, client.ACLRule{Prefix: prefix, Permissions: strings.Split(perms, ",")})
	return nil
}

func newACLCmd() *cobra.Command {
	token := groupCommand("token", "create, list and revoke ACL tokens", aclLong, "create, list or revoke",
		newACLTokenCreateCmd(), aclCmd("list", "list the ACL tokens", noArgs, func(ctx context.Context, c *client.Client, g *globalFlags, _ []string) error {
			ts, err := c.ListACLTokens(ctx)
			if err != nil {
				return err
			}
			if g.json() {
				return printJSONOut(ts)
			}
			for _, t := range ts {
				var rs []string
				for _, r := range t.Rules {
					rs = append(rs, fmt.Sprintf("%q=%s", r.Prefix, strings.Join(r.Permissions, ",")))
				}
				if !t.ExpiresAt.IsZero() {
					t.Description += " (expires " + t.ExpiresAt.Format(time.RFC3339) + ")"
				}
				ids := "any client id"
				if len(t.ClientIDs) > 0 {
					ids = strings.Join(t.ClientIDs, ",")
				}
				fmt.Printf("%s  %s  (%s)  %s\n", t.AccessorID, strings.Join(rs, " "), ids, t.Description)
			}
			return nil
		}),
		aclCmd("revoke ACCESSOR_ID", "revoke an ACL token", exactArgs(1, "want: dlock acl token revoke ACCESSOR_ID"), func(ctx context.Context, c *client.Client, g *globalFlags, pos []string) error {
			if err := c.DeleteACLToken(ctx, pos[0]); err != nil {
				return err
			}
			if g.json() {
				return printJSONOut(map[string]bool{"revoked": true})
			}
			fmt.Println("revoked", pos[0])
			return nil
		}),
	)
	bootstrap := aclCmd("bootstrap", "create the first management token of a cluster run with --acl", noArgs,
		func(ctx context.Context, c *client.Client, g *globalFlags, _ []string) error {
			t, err := c.ACLBootstrap(ctx)
			if err != nil {
				return err
			}
			return printNewToken(g, t)
		})
	bootstrap.Long = "Creates the first management token of a cluster run with --acl (works once;\nprints the secret, which is shown only this time)."
	return markClient(groupCommand("acl", "manage ACL tokens (clusters run with --acl)", aclLong, "bootstrap or token create|list|revoke", bootstrap, markClient(token)))
}

// markClient makes a group's own usage errors follow -o json too.
func markClient(cmd *cobra.Command) *cobra.Command {
	cmd.Annotations[clientAnnotation] = "true"
	return cmd
}

// aclCmd is an acl subcommand that talks to the cluster.
func aclCmd(use, short string, args cobra.PositionalArgs, run func(ctx context.Context, c *client.Client, g *globalFlags, pos []string) error) *cobra.Command {
	var g globalFlags
	cmd := &cobra.Command{Use: use, Short: short, Long: aclLong, Args: args, ValidArgsFunction: cobra.NoFileCompletions}
	cmd.RunE = func(_ *cobra.Command, pos []string) error {
		c, ctx, done, err := g.connect(0)
		if err != nil {
			return err
		}
		defer done()
		return run(ctx, c, &g, pos)
	}
	return clientCmd(cmd, &g)
}

func newACLTokenCreateCmd() *cobra.Command {
	var rules ruleFlags
	var clientIDs, description, certCNs string
	var ttl time.Duration
	cmd := aclCmd("create --rule PREFIX=PERM[,PERM...] [--rule ...]", "create an ACL token", noArgs,
		func(ctx context.Context, c *client.Client, g *globalFlags, _ []string) error {
			if len(rules) == 0 {
				return usageErrorf("give at least one --rule PREFIX=PERM")
			}
			req := client.NewACLToken{Description: description, Rules: rules, TTLms: ttl.Milliseconds()}
			for cn := range strings.SplitSeq(certCNs, ",") {
				if cn = strings.TrimSpace(cn); cn != "" {
					req.CertCNs = append(req.CertCNs, cn)
				}
			}
			for id := range strings.SplitSeq(clientIDs, ",") {
				if id = strings.TrimSpace(id); id != "" {
					req.ClientIDs = append(req.ClientIDs, id)
				}
			}
			t, err := c.CreateACLToken(ctx, req)
			if err != nil {
				return err
			}
			return printNewToken(g, t)
		})
	cmd.Long = `Creates a token. PERM is read, lock, elect, watch, admin or all;
--rule =all grants everything on every name.` + "\n\n" + aclLong
	cmd.Example = "  dlock acl token create --rule billing/=lock,read --client-ids 'worker-*' --description workers"
	fs := cmd.Flags()
	fs.Var(&rules, "rule", "PREFIX=PERM[,PERM...] (repeatable); PERM is read, lock, elect, watch, admin or all")
	fs.StringVar(&clientIDs, "client-ids", "", "client `IDS` the token may act as (comma-separated; a trailing * matches any suffix); default any")
	fs.StringVar(&description, "description", "", "what the token is for")
	fs.DurationVar(&ttl, "ttl", 0, "the token expires this long after it is created (default: never)")
	fs.StringVar(&certCNs, "cert-cns", "", "client-certificate common `NAMES` that authenticate as this token over mutual TLS (comma-separated)")
	return cmd
}

func printNewToken(g *globalFlags, t *client.ACLToken) error {
	if g.json() {
		return printJSONOut(t)
	}
	fmt.Printf("accessor_id %s\nsecret_id   %s\n", t.AccessorID, t.SecretID)
	fmt.Println("(the secret is shown only now: pass it with --acl-token or DLOCK_ACL_TOKEN)")
	return nil
}
