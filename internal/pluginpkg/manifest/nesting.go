package manifest

// MaxNesting bounds how deep a manifest may nest: the parts of its table
// header, of a dotted key under it, and the arrays and inline tables
// holding a value, together. The TOML decoder (BurntSushi/toml v1.6.0)
// costs time and memory quadratic in that depth for every value, so a
// document of a few KiB could otherwise take gigabytes; no real manifest
// comes near the bound.
const MaxNesting = 32

// checkNesting refuses a document nesting deeper than MaxNesting before it
// reaches the decoder. It reads the raw bytes once, skipping strings and
// comments so that brackets and dots inside them do not count, and names
// the line at fault. The depth it counts is an upper bound of the parsed
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
	)
	tooDeep := func() error {
		return fieldErr("manifest", "line %d: keys, arrays and inline tables nest deeper than %d levels", line, MaxNesting)
	}
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '\n':
			line++
			dots, key = 0, 0
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
			key, dots = dots, 0
			if len(open) == 0 {
				valued = true
			}
		case ',':
			dots, key = 0, 0
		case '.':
			// Outside strings a dot separates key parts; a value holds at
			// most one (a float, a datetime's fraction).
			dots++
			if table+levels+key+dots > MaxNesting {
				return tooDeep()
			}
		case '[', '{':
			add := key + 1
			if c == '[' && len(open) == 0 && !valued {
				// A table header: it replaces the table values nest in.
				inTable, table, add = true, 0, 1
			}
			open = append(open, add)
			levels += add
			dots, key = 0, 0
			if table+levels > MaxNesting {
				return tooDeep()
			}
		case ']', '}':
			if len(open) > 0 {
				levels -= open[len(open)-1]
				open = open[:len(open)-1]
			}
			if inTable && parts == 0 {
				parts = dots + 1 // the header's first ']' ("[a.b]", "[[a.b]]")
			}
			if inTable && len(open) == 0 {
				inTable, table, parts = false, parts, 0
			}
			dots, key = 0, 0
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
