package install

// SetBeforeOpen has hook called with each local source entry's path just
// before the copy opens it, until the returned func puts it back.
func SetBeforeOpen(hook func(path string)) (undo func()) {
	old := beforeOpen
	beforeOpen = hook
	return func() { beforeOpen = old }
}
