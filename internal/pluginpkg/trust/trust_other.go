//go:build !unix

package trust

// CheckPluginsDir checks nothing where the platform has no owners and
// modes to read.
func CheckPluginsDir(string) error { return nil }

// CheckPluginsDirItself checks nothing where the platform has no owners
// and modes to read.
func CheckPluginsDirItself(string) error { return nil }

// CheckPluginFolder checks nothing where the platform has no owners and
// modes to read.
func CheckPluginFolder(string) error { return nil }
