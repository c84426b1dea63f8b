package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock/client"
)

const aclUsage = `Usage:
  dlock acl bootstrap
        create the first management token of a cluster run with --acl
        (works once; prints the secret, which is shown only this time)
  dlock acl token create --rule PREFIX=PERM[,PERM...] [--rule ...]
                         [--client-ids ID,worker-*] [--description TEXT] [--ttl D]
                         [--cert-cns CN,...]
        create a token; PERM is read, lock, elect, watch, admin or all;
        --rule =all grants everything on every name
  dlock acl token list
  dlock acl token revoke ACCESSOR_ID

Tokens are sent with --acl-token or DLOCK_ACL_TOKEN. docs/security.md explains the
permissions.
`

// ruleFlags collects repeated --rule flags.
type ruleFlags []client.ACLRule

func (r *ruleFlags) String() string { return fmt.Sprint(*r) }

func (r *ruleFlags) Set(v string) error {
	prefix, perms, ok := strings.Cut(v, "=")
	if !ok || perms == "" {
		return fmt.Errorf("--rule %q: want PREFIX=PERM[,PERM...], e.g. billing/=lock,read", v)
	}
	*r = append(*r, client.ACLRule{Prefix: prefix, Permissions: strings.Split(perms, ",")})
	return nil
}

func runACL(args []string) error {
	if len(args) == 0 {
		return usageErrorf("want: dlock acl bootstrap | token create|list|revoke")
	}
	if wantsHelp(args) || (args[0] == "token" && wantsHelp(args[1:])) {
		return printHelp(aclUsage)
	}
	sub := args[0]
	if sub == "token" {
		if len(args) < 2 {
			return usageErrorf("want: dlock acl token create|list|revoke")
		}
		sub, args = "token "+args[1], args[2:]
	} else {
		args = args[1:]
	}
	fs := newCmdFlags("acl "+sub, aclUsage)
	var g globalFlags
	g.register(fs)
	var rules ruleFlags
	var clientIDs, description string
	var ttl time.Duration
	var certCNs string
	npos := 0
	switch sub {
	case "bootstrap", "token list":
	case "token create":
		fs.Var(&rules, "rule", "PREFIX=PERM[,PERM...] (repeatable)")
		fs.StringVar(&clientIDs, "client-ids", "", "client ids the token may act as (comma-separated; a trailing * matches any suffix); default any")
		fs.StringVar(&description, "description", "", "what the token is for")
		fs.DurationVar(&ttl, "ttl", 0, "the token expires this long after it is created (default: never)")
		fs.StringVar(&certCNs, "cert-cns", "", "client-certificate common names that authenticate as this token over mutual TLS (comma-separated)")
	case "token revoke":
		npos = 1
	default:
		return usageErrorf("unknown acl command %q: use bootstrap or token create|list|revoke", sub)
	}
	pos, rest, err := parseCmd(fs, &g, args, npos)
	if err != nil {
		return err
	}
	if len(rest) != 0 || len(pos) != npos {
		return usageErrorf("wrong arguments for dlock acl %s", sub)
	}
	c, ctx, done, err := g.connect(0)
	if err != nil {
		return err
	}
	defer done()
	switch sub {
	case "bootstrap", "token create":
		var t *client.ACLToken
		if sub == "bootstrap" {
			t, err = c.ACLBootstrap(ctx)
		} else {
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
			t, err = c.CreateACLToken(ctx, req)
		}
		if err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(t)
		}
		fmt.Printf("accessor_id %s\nsecret_id   %s\n", t.AccessorID, t.SecretID)
		fmt.Println("(the secret is shown only now: pass it with --acl-token or DLOCK_ACL_TOKEN)")
	case "token list":
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
	case "token revoke":
		if err := c.DeleteACLToken(ctx, pos[0]); err != nil {
			return err
		}
		if g.json() {
			return printJSONOut(map[string]bool{"revoked": true})
		}
		fmt.Println("revoked", pos[0])
	}
	return nil
}
