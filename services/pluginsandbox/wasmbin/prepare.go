package wasmbin

import "fmt"

// Options select what Prepare does.
type Options struct {
	// MaxTableElements is the table-element limit; it must be positive.
	MaxTableElements uint64
	// Fuel adds the fuel counter and a charge at every segment.
	Fuel bool
	// MergeData joins data segments (see mergeData).
	MergeData bool
}

// Report describes what Prepare did.
type Report struct {
	Functions          int
	FuelCharges        int
	DataSegmentsBefore int
	DataSegmentsAfter  int
	UsesTableGrow      bool
}

// Prepare checks the tables of a module against the limit and rewrites it as
// the options say. The input is not modified.
func Prepare(wasm []byte, opts Options) ([]byte, Report, error) {
	var rep Report
	if opts.MaxTableElements == 0 {
		return nil, rep, fmt.Errorf("%w: table limit is zero", ErrTableLimit)
	}
	m, err := Parse(wasm)
	if err != nil {
		return nil, rep, err
	}
	if err := m.checkCounts(); err != nil {
		return nil, rep, err
	}
	bodies, err := decodeCode(m.section(secCode))
	if err != nil && m.section(secCode) != nil {
		return nil, rep, err
	}
	rep.Functions = len(bodies)
	usesDataIndex := false
	if err := scanOps(bodies, func(op uint32) {
		switch op {
		case opTableGrow:
			rep.UsesTableGrow = true
		case opMemoryInit, opDataDrop:
			usesDataIndex = true
		}
	}); err != nil {
		return nil, rep, err
	}
	if err := m.checkTables(opts.MaxTableElements, rep.UsesTableGrow); err != nil {
		return nil, rep, err
	}
	m.StripCustomSections(".debug_")
	if opts.Fuel {
		if rep.FuelCharges, err = m.instrumentFuel(bodies); err != nil {
			return nil, rep, err
		}
	}
	if opts.MergeData {
		if rep.DataSegmentsBefore, rep.DataSegmentsAfter, err = m.mergeData(usesDataIndex); err != nil {
			return nil, rep, err
		}
	}
	return m.Encode(), rep, nil
}
