package pluginsandbox

// SetRestoreHook has hook called before a memory restore stores its i-th
// entry, until the returned func puts the hook back.
func SetRestoreHook(hook func(i int)) (undo func()) {
	old := restoreHook
	restoreHook = hook
	return func() { restoreHook = old }
}

// SetListBudget sets the bound of a listing's answer until the returned
// func puts it back.
func SetListBudget(n int) (undo func()) {
	old := listBudget
	listBudget = n
	return func() { listBudget = old }
}
