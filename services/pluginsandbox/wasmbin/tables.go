package wasmbin

import "fmt"

// checkTables enforces the table-element limit before compilation, since
// wazero enforces only a table's declared maximum: every table's minimum and
// declared maximum must be at most limit, and a table without a maximum is
// refused when the module contains table.grow.
func (m *Module) checkTables(limit uint64, growsTables bool) error {
	all := append(append([]Limits(nil), m.ImportedTables...), m.Tables...)
	for i, t := range all {
		switch {
		case t.Min > limit:
			return fmt.Errorf("%w: table %d starts with %d elements, limit %d", ErrTableLimit, i, t.Min, limit)
		case t.HasMax && t.Max > limit:
			return fmt.Errorf("%w: table %d may grow to %d elements, limit %d", ErrTableLimit, i, t.Max, limit)
		case !t.HasMax && growsTables:
			return fmt.Errorf("%w: table %d has no maximum and the module uses table.grow", ErrTableLimit, i)
		}
	}
	return nil
}
