package api

import (
	_ "embed"
	"slices"
)

//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPI returns the API's OpenAPI 3 document (YAML), for publishing at
// /api/openapi.yaml. TestOpenAPI holds the handler to it: every route,
// method and status, and the fields of every body.
func OpenAPI() []byte { return slices.Clone(openapiYAML) }
