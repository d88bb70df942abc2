// Command list prints the package of every binary of the stack, one per
// line, for the Makefile: go build -o bin/ $(go run ./internal/stack/list).
package main

import (
	"fmt"

	"github.com/clawmesh/clawmesh/internal/stack"
)

func main() {
	for _, p := range stack.Packages() {
		fmt.Println(p)
	}
}
