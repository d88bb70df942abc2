package manifest

// MaxNesting bounds how deep a manifest may nest: the parts of its table
// header, of a dotted key under it, and the arrays and inline tables
// holding a value, together. The TOML decoder (BurntSushi/toml v1.6.0)
// costs time and memory quadratic in that depth for every value, so a
// document of a few KiB could otherwise take gigabytes; no real manifest
// comes near the bound.
const MaxNesting = 32

// maxKeyCost bounds what the keys of one manifest may cost the TOML
// decoder, in about bytes allocated. Within MaxNesting the decoder still
// joins every key's full path (its table header, the keys of the inline
// tables and arrays around it, the key itself) into strings, several
// times a key and once per prefix of a dotted key, each string at least
// 25 bytes a part: 256 KiB of 31-part dotted keys allocated 310 MiB, a
// 32 KiB table header with 27,000 short keys under it 3.9 GiB. A real
// manifest's keys cost a few MiB at most (2,000 keys six parts deep,
// about 2 MiB).
const maxKeyCost = 32 << 20

// keyCost is what checkNesting charges a key of parts parts (a dotted
// key's prefixes, each joined again) whose full path has n parts and b
// bytes: an estimate of the decoder's allocation for it. Let through up
// to the bound, the shapes of TestParseBoundsDecoderCost allocate from 4%
// to 106% of what they were charged, the rest of the document included.
func keyCost(parts, n, b int) int64 {
	return 4 * int64(parts) * int64(32*n+2*b)
}

// checkNesting refuses a document nesting deeper than MaxNesting, or whose
// keys would cost the decoder more than maxKeyCost, before it reaches the
// decoder. It reads the raw bytes once, skipping strings and comments so
// that brackets and dots inside them do not count, and names the line at
// fault. The depth and the bytes it counts are upper bounds of the parsed
// document's; a document it lets through may still be invalid TOML, which
// the decoder reports.
func checkNesting(data []byte) error {
	var (
		line    = 1
		open    []int // per open bracket, the levels it adds: itself and its key's parts
		levels  = 0   // the sum of open
		table   = 0   // the parts of the last table header
		parts   = 0   // the parts of the table header being read
		key     = 0   // the dots of the key before the last '='
		dots    = 0   // the dots since the last separator
		valued  = false
		inTable = false
		// The bytes of keys, for keyCost: where the key being read
		// started, the key before the last '=', the last table header,
		// and per open bracket the key its value belongs to (0 for a
		// header), with their sum.
		keyStart   = 0
		keyBytes   = 0
		hdrStart   = 0
		tableBytes = 0
		openBytes  []int
		pathBytes  = 0
		cost       int64
	)
	tooDeep := func() error {
		return fieldErr("manifest", "line %d: keys, arrays and inline tables nest deeper than %d levels", line, MaxNesting)
	}
	charge := func(parts, n, b int) error {
		if cost += keyCost(parts, n, b); cost > maxKeyCost {
			return fieldErr("manifest", "line %d: too many keys for their length and depth (the TOML decoder would need over %d MiB for them); use shorter keys, or nest less", line, maxKeyCost>>20)
		}
		return nil
	}
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '\n':
			line++
			dots, key, keyBytes, keyStart = 0, 0, 0, i+1
			if len(open) == 0 {
				valued = false
			}
		case '#':
			for i+1 < len(data) && data[i+1] != '\n' {
				i++
			}
		case '"', '\'':
			var n int
			i, n = skipString(data, i)
			line += n
		case '=':
			keyBytes = i - keyStart
			if err := charge(dots+1, table+levels+dots+1, tableBytes+pathBytes+keyBytes); err != nil {
				return err
			}
			key, dots = dots, 0
			if len(open) == 0 {
				valued = true
			}
		case ',':
			dots, key, keyBytes, keyStart = 0, 0, 0, i+1
		case '.':
			// Outside strings a dot separates key parts; a value holds at
			// most one (a float, a datetime's fraction).
			dots++
			if table+levels+key+dots > MaxNesting {
				return tooDeep()
			}
		case '[', '{':
			add, kb := key+1, keyBytes
			if c == '[' && len(open) == 0 && !valued {
				// A table header: it replaces the table values nest in.
				inTable, table, add, kb = true, 0, 1, 0
				hdrStart, tableBytes = i, 0
			}
			open = append(open, add)
			openBytes = append(openBytes, kb)
			levels += add
			pathBytes += kb
			dots, key, keyBytes, keyStart = 0, 0, 0, i+1
			if table+levels > MaxNesting {
				return tooDeep()
			}
			if c == '{' {
				if err := charge(1, table+levels, tableBytes+pathBytes); err != nil {
					return err
				}
			}
		case ']', '}':
			if len(open) > 0 {
				levels -= open[len(open)-1]
				open = open[:len(open)-1]
				pathBytes -= openBytes[len(openBytes)-1]
				openBytes = openBytes[:len(openBytes)-1]
			}
			if inTable && parts == 0 {
				parts = dots + 1 // the header's first ']' ("[a.b]", "[[a.b]]")
			}
			if inTable && len(open) == 0 {
				inTable, table, parts = false, parts, 0
				tableBytes = i - hdrStart
				if err := charge(table, table, tableBytes); err != nil {
					return err
				}
			}
			dots, key, keyBytes, keyStart = 0, 0, 0, i+1
		}
	}
	return nil
}

// skipString returns the index of the last byte of the string opening at
// data[i] (a quote) and how many newlines it holds. A single-line string
// ends at a newline whatever follows: the decoder refuses it there, so
// nothing after it is read as string content by one and not the other.
func skipString(data []byte, i int) (end, newlines int) {
	q := data[i]
	escapes := q == '"'
	if i+2 < len(data) && data[i+1] == q && data[i+2] == q {
		// Multi-line: ends at three quotes, which may be followed by up to
		// two more that belong to the content.
		for j := i + 3; j < len(data); j++ {
			switch {
			case data[j] == '\n':
				newlines++
			case escapes && data[j] == '\\':
				if j+1 < len(data) && data[j+1] == '\n' {
					newlines++
				}
				j++
			case data[j] == q && j+2 < len(data) && data[j+1] == q && data[j+2] == q:
				j += 2
				for k := 0; k < 2 && j+1 < len(data) && data[j+1] == q; k++ {
					j++
				}
				return j, newlines
			}
		}
		return len(data) - 1, newlines
	}
	for j := i + 1; j < len(data); j++ {
		switch {
		case data[j] == '\n':
			return j - 1, 0
		case escapes && data[j] == '\\':
			if j+1 < len(data) && data[j+1] == '\n' {
				return j, 0
			}
			j++
		case data[j] == q:
			return j, 0
		}
	}
	return len(data) - 1, 0
}
