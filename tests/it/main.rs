mod run;
mod ssh;
mod support;
