package demo

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"slices"

	"github.com/dlock/dlock/fence"
)

// forgedToken is a Byzantine client's "very high fencing token".
const forgedToken = 999999

// stepE: tokens are sequential, so anyone can guess a high one; the token
// proof is what makes a guessed or borrowed token worthless.
func (e *env) stepE(ctx context.Context) error {
	h := e.l3
	real := h.grant()
	borrowed := real
	borrowed.FencingToken = forgedToken
	if err := e.mustRefuse(ctx, borrowed, fmt.Sprintf("a forger sends token %d for l3 with client2's real proof (signed for token %d)", forgedToken, real.FencingToken)); err != nil {
		return err
	}
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	selfSigned := borrowed
	selfSigned.ClientID = "mallory"
	selfSigned.TokenProof = fence.SignProof(key, selfSigned.Lock, forgedToken, selfSigned.ClientID, selfSigned.LeaseRef)
	if err := e.mustRefuse(ctx, selfSigned, fmt.Sprintf("mallory sends token %d for l3 with a proof signed by a key of its own", forgedToken)); err != nil {
		return err
	}
	// Had a forged token got in, the honest holder would now be refused.
	if err := e.mustWrite(ctx, real, "client2 again: the forgeries changed nothing"); err != nil {
		return err
	}

	recs, err := e.storedRecords(ctx)
	if err != nil {
		return err
	}
	if !slices.Equal(recs, e.accepted) {
		return fmt.Errorf("GET /data lists %d records %v, want exactly the %d accepted writes %v", len(recs), recs, len(e.accepted), e.accepted)
	}
	e.say("GET /data: %d records, exactly the accepted writes, in order; nothing of the refused ones:", len(recs))
	for _, r := range recs {
		e.say("    %s", r)
	}
	if err := h.unlock(ctx); err != nil {
		return err
	}
	e.done("e. token %d with a borrowed proof and with a self-signed one: 403 bad_proof; GET /data holds exactly the %d accepted writes", forgedToken, len(recs))
	return nil
}

// mustRefuse sends a forged write: it must be refused as 403 bad_proof.
func (e *env) mustRefuse(ctx context.Context, g grant, what string) error {
	a, err := e.write(ctx, g, "forged")
	if err != nil {
		return err
	}
	e.say("%s: %s", what, a)
	if a.Status != http.StatusForbidden || a.code() != "bad_proof" {
		return fmt.Errorf("%s: the data store answered %s, want 403 bad_proof", what, a)
	}
	return nil
}
