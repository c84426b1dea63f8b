package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/service"
)

func badRequest(format string, args ...any) *apierror.Error {
	return apierror.New(apierror.InvalidArgument, format, args...)
}

// decodeBody reads the JSON object body into v. An optional body may be
// absent or blank, leaving v zero.
func (a *api) decodeBody(w http.ResponseWriter, r *http.Request, v any, required bool) *apierror.Error {
	tooLarge := func() *apierror.Error {
		return apierror.New(apierror.TooLarge, "request body is larger than %d bytes", a.maxBody)
	}
	// Refusing on the declared length first means a client that sent
	// "Expect: 100-continue" never uploads the oversized body at all.
	if r.ContentLength > a.maxBody {
		return tooLarge()
	}
	var b []byte
	if r.Body != nil {
		var err error
		b, err = io.ReadAll(http.MaxBytesReader(w, r.Body, a.maxBody))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return tooLarge()
			}
			return badRequest("could not read the request body: %v", err)
		}
		bodyDone(w)
	}
	if len(trimJSONSpace(b)) == 0 {
		if required {
			return badRequest("request body is empty; send a JSON object")
		}
		return nil
	}
	if aerr := checkContentType(r.Header.Get("Content-Type")); aerr != nil {
		return aerr
	}
	return decodeJSON(b, v)
}

// checkContentType accepts only JSON (application/json or application/*+json,
// in UTF-8), and answers anything else — a missing Content-Type too — with
// 415 unsupported_media_type: a browser cannot send such a body cross-site
// without asking the server first (browser.go).
func checkContentType(ct string) *apierror.Error {
	if ct == "" {
		return apierror.New(apierror.UnsupportedMediaType, "a request with a body must say Content-Type: application/json (curl: --json, or -H 'Content-Type: application/json')")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		if cs, ok := params["charset"]; !ok || strings.EqualFold(cs, "utf-8") {
			return nil
		}
	}
	return apierror.New(apierror.UnsupportedMediaType, "Content-Type %q is not JSON; send application/json (curl: --json, or -H 'Content-Type: application/json')", ct)
}

func trimJSONSpace(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }

// decodeJSON decodes exactly one JSON object into v. Besides
// DisallowUnknownFields it walks the top-level keys itself, because
// encoding/json matches keys case-insensitively and lets a repeated key
// silently win: {"client_id":"a","CLIENT_ID":"b"} must be a 400, not a guess.
func decodeJSON(b []byte, v any) *apierror.Error {
	if !utf8.Valid(b) {
		return badRequest("request body is not valid UTF-8")
	}
	fields := fieldsOf(v)
	// The exact-key pass costs more than the decoding itself when done with
	// json.Decoder tokens (docs/benchmarks.md): the common body takes a
	// scan without allocations, and anything it is unsure of — or any body
	// that then fails to decode — goes through checkKeys, so every answer
	// stays what checkKeys says.
	fast := keysPlain(b, fields)
	if !fast {
		if aerr := checkKeys(b, fields); aerr != nil {
			return aerr
		}
	}
	// keysPlain has already seen one object with known keys and nothing
	// after it, which is all the Decoder below adds to Unmarshal; Unmarshal
	// decodes from b without copying it into a decoder's buffer. Any error
	// is answered by the Decoder path, so the answer stays the same.
	if fast && json.Unmarshal(b, v) == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if fast {
			if aerr := checkKeys(b, fields); aerr != nil {
				return aerr
			}
		}
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body has data after the JSON object; send exactly one object")
	}
	return nil
}

// keysPlain reports, without allocating, that b is one JSON object whose
// top-level keys are all in fields, each once, spelt without escapes, with
// nothing after it. Values are only skipped, not checked: the decoder does
// that. false means "not sure", never "bad".
func keysPlain(b []byte, fields []string) bool {
	if len(fields) > 64 {
		return false
	}
	var seen uint64
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		start := i + 1
		end := start
		for end < len(b) && b[end] != '"' {
			if b[end] == '\\' || b[end] < 0x20 {
				return false
			}
			end++
		}
		if end >= len(b) {
			return false
		}
		known := false
		for k, f := range fields {
			if string(b[start:end]) == f {
				if seen&(1<<k) != 0 {
					return false
				}
				seen |= 1 << k
				known = true
				break
			}
		}
		if !known {
			return false
		}
		i = skipSpace(b, end+1)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		var ok bool
		if i, ok = skipJSONValue(b, skipSpace(b, i+1)); !ok {
			return false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipJSONValue returns the index just after the value starting at i: a
// string, an object or array (strings inside them included), or a number or
// literal up to the next delimiter.
func skipJSONValue(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch c := b[i]; c {
		case '"':
			i++
			for i < len(b) && b[i] != '"' {
				if b[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(b) {
				return 0, false
			}
			i++
		case '{', '[':
			depth++
			i++
		case '}', ']':
			if depth == 0 {
				return i, i > 0
			}
			depth--
			i++
		case ',':
			if depth == 0 {
				return i, true
			}
			i++
		default:
			i++
		}
		if depth == 0 && i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i, true
			}
		}
	}
	return i, depth == 0
}

// checkKeys verifies that b is one JSON object whose top-level keys are all in
// fields, exactly spelled, each at most once, and that nothing follows it.
// Values are only skipped here; their types are checked when decoding.
func checkKeys(b []byte, fields []string) *apierror.Error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return jsonError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return badRequest("request body must be a JSON object")
	}
	// A key problem is reported only once the whole body has parsed: broken
	// JSON is the more basic mistake, and its message points at a byte.
	var keyErr *apierror.Error
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err)
		}
		key, ok := tok.(string)
		if !ok {
			return badRequest("request body is not valid JSON: object key is not a string")
		}
		switch {
		case keyErr != nil:
		case !slices.Contains(fields, key):
			keyErr = badRequest("unknown field %q; this call accepts: %s", key, strings.Join(fields, ", "))
		case seen[key]:
			keyErr = badRequest("field %q is given more than once", key)
		}
		seen[key] = true
		if err := skipValue(dec); err != nil {
			return jsonError(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body has data after the JSON object; send exactly one object")
	}
	return keyErr
}

func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}

// jsonError turns a decoding error into a message that names what to fix.
func jsonError(err error) *apierror.Error {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if te.Field == "" {
			return badRequest("request body must be a JSON object")
		}
		return badRequest("field %q must be %s, not %s", te.Field, jsonKind(te.Type), te.Value)
	}
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return badRequest("request body is not valid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badRequest("request body is truncated JSON")
	}
	return badRequest("request body is not valid: %s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "of type " + t.String()
}

var fieldCache sync.Map // reflect.Type → []string

// fieldsOf lists the JSON keys of the struct v points to, in declaration
// order, skipping json:"-" fields (the path parts, which a body may not set).
func fieldsOf(v any) []string {
	t := reflect.TypeOf(v).Elem()
	if f, ok := fieldCache.Load(t); ok {
		return f.([]string)
	}
	var fields []string
	for sf := range t.Fields() {
		if !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = sf.Name
		}
		fields = append(fields, name)
	}
	fieldCache.Store(t, fields)
	return fields
}

// parseQuery parses the query string and refuses parameters outside allowed,
// or given twice: a misspelt "?prefx=" silently listing everything would be
// the silent 200 on bad input that design.md §7 rules out.
func parseQuery(r *http.Request, allowed ...string) (url.Values, *apierror.Error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, badRequest("query string is malformed: %v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) { // sorted: one stable message
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return nil, badRequest("unknown query parameter %q; this call takes none", k)
			}
			return nil, badRequest("unknown query parameter %q; this call accepts: %s", k, strings.Join(allowed, ", "))
		}
		if len(q[k]) > 1 {
			return nil, badRequest("query parameter %q is given more than once", k)
		}
	}
	return q, nil
}

// parseStale reads ?stale. A bare "?stale" means true, as in Consul.
func parseStale(q url.Values) (bool, *apierror.Error) { return parseBool(q, "stale") }

// parseBool reads a boolean query parameter; bare "?key" means true.
func parseBool(q url.Values, key string) (bool, *apierror.Error) {
	v, ok := q[key]
	if !ok {
		return false, nil
	}
	switch v[0] {
	case "", "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, badRequest("query parameter %s=%q must be true or false", key, v[0])
}

func listRequest(q url.Values) (service.ListRequest, *apierror.Error) {
	var req service.ListRequest
	var err error
	if req.Prefix, err = command.ValidatePrefix(q.Get("prefix")); err != nil {
		return req, badRequest("bad prefix: %v", err)
	}
	// after is the last name of the previous page, so name characters only;
	// it need not be a whole valid name to be a position in name order.
	if req.After, err = command.ValidatePrefix(q.Get("after")); err != nil {
		return req, badRequest("bad after: %s", strings.Replace(err.Error(), "prefix", "after", 1))
	}
	if s, ok := q["limit"]; ok {
		// The range (0 = default, at most service.MaxListLimit) is the
		// service's to enforce, the same for gRPC; the syntax is checked here.
		n, err := strconv.ParseUint(s[0], 10, 31)
		if err != nil {
			return req, badRequest("query parameter limit=%q must be a non-negative integer (at most %d)", s[0], service.MaxListLimit)
		}
		req.Limit = int(n)
	}
	stale, aerr := parseStale(q)
	req.Stale = stale
	return req, aerr
}
