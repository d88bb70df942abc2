//go:build !unix

package pluginsandbox

// Where the platform has no owners and modes to read, nothing is checked.
func checkPluginsDir(string) error   { return nil }
func checkPluginFolder(string) error { return nil }
