// Package jsonexact decodes JSON values the way encoding/json decodes
// into `any` (objects, arrays, strings, booleans, float64 numbers), but
// refuses a number that a float64 does not hold exactly, instead of
// rounding it: 2^53+1 read into a float64 is 2^53, and an integer limit
// set to it would silently be another one.
package jsonexact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
)

// Errors.
var (
	// ErrSyntax: the input is not one JSON value.
	ErrSyntax = errors.New("not valid JSON")
	// ErrInexact: a number a float64 cannot hold exactly: of magnitude
	// 2^53 or more and not one of the floats there (above 2^53 not every
	// integer is), or beyond the float64 range.
	ErrInexact = errors.New("number cannot be held exactly")
)

// exactBelow is 2^53: every integer of smaller magnitude is a float64.
const exactBelow = 1 << 53

// Decode reads one JSON value.
func Decode(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSyntax, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the value", ErrSyntax)
	}
	return convert(v, "")
}

// convert replaces the numbers inside v; an error names where, as a path
// of keys and indexes below the value ("limits.fuel", "[2]").
func convert(v any, path string) (any, error) {
	switch x := v.(type) {
	case json.Number:
		f, err := Number(string(x))
		if err != nil && path != "" {
			return nil, fmt.Errorf("at %s: %w", path, err)
		}
		return f, err
	case []any:
		for i, item := range x {
			c, err := convert(item, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			x[i] = c
		}
	case map[string]any:
		for k, item := range x {
			sub := k
			if path != "" {
				sub = path + "." + k
			}
			c, err := convert(item, sub)
			if err != nil {
				return nil, err
			}
			x[k] = c
		}
	}
	return v, nil
}

// Number reads a JSON number literal as a float64, refusing it with
// ErrInexact when the float64 would not be the number written.
func Number(lit string) (float64, error) {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: %s is beyond the range of a float64", ErrInexact, lit)
	}
	// Below 2^53 an integer is exact and a fraction a float's business;
	// from there on every float is an integer, and the literal must be
	// one of them. The float being finite bounds the literal's exponent,
	// so the exact comparison stays small.
	if math.Abs(f) >= exactBelow {
		r, ok := new(big.Rat).SetString(lit)
		if !ok {
			return 0, fmt.Errorf("%w: %s", ErrSyntax, lit)
		}
		if _, exact := r.Float64(); !exact {
			return 0, fmt.Errorf("%w: %s is not a float64 (integers are exact only within ±2^53 = ±%d)", ErrInexact, lit, int64(exactBelow))
		}
	}
	return f, nil
}
