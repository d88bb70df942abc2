// Package migrations holds the durable bridge's schema migrations, applied
// in order at start by internal/pg.
package migrations

import "embed"

// FS holds the NNNN_name.sql files.
//
//go:embed *.sql
var FS embed.FS
