//! Host implementations of the imported interfaces, one file per interface.
