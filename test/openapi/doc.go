// Package openapi checks the OpenAPI description of the HTTP API
// (api/openapi/dlock.yaml) against a real cluster: every operation is
// driven, every request and answer is validated against the document, and
// every field the document declares on an answer must be seen at least
// once, so the two cannot drift either way. It also lints the document with
// Redocly's CLI when that is installed.
package openapi
