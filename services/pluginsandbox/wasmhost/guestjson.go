package wasmhost

import (
	"bytes"
	"encoding/json"
)

// guestJSON encodes an argument for a guest as encoding/json does, but
// leaves <, > and & as they are: escaped, each is six bytes the guest
// decodes one at a time, paid in its fuel (512 KiB of "<a&b>" spent a
// Go guest's 10^9 on a memory store, when fastjson unescaped it and the
// meter charged blocks; as they are, 33 x 10^6).
func guestJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
