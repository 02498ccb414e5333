//go:build !unix

package redistest

import "os"

func pause(*os.Process) error { return errNoPause }

func resume(*os.Process) error { return nil }
