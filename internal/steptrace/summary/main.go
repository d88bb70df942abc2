// Command summary prints, for the traces of internal/steptrace in a
// folder, each process's steps with their count, median and mean in
// milliseconds, in the order they first appear.
package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: summary <folder of *.trace files>")
		os.Exit(2)
	}
	files, err := filepath.Glob(filepath.Join(os.Args[1], "*.trace"))
	if err != nil || len(files) == 0 {
		fmt.Fprintln(os.Stderr, "summary: no *.trace files in", os.Args[1])
		os.Exit(1)
	}
	var order []string
	times := map[string][]float64{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "summary:", err)
			os.Exit(1)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			i := strings.LastIndexByte(sc.Text(), ' ')
			if i < 0 {
				continue
			}
			ms, err := strconv.ParseFloat(sc.Text()[i+1:], 64)
			if err != nil {
				continue
			}
			key := sc.Text()[:i]
			if _, ok := times[key]; !ok {
				order = append(order, key)
			}
			times[key] = append(times[key], ms)
		}
		f.Close()
	}
	fmt.Printf("%-40s %6s %9s %9s\n", "process step", "n", "median", "mean")
	for _, key := range order {
		v := times[key]
		sum := 0.0
		for _, x := range v {
			sum += x
		}
		s := slices.Clone(v)
		slices.Sort(s)
		med := s[len(s)/2]
		if len(s)%2 == 0 {
			med = (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
		fmt.Printf("%-40s %6d %9.3f %9.3f\n", key, len(v), med, sum/float64(len(v)))
	}
}
